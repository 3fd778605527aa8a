module loopguard.example/agent

go 1.19

require github.com/nats-io/nats.go v1.22.1
