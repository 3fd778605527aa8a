// A naive agent in Go (nats.go), behind loopguard.
//
// It reads its inbox and answers its peer, forever; loopguard stops the loop
// at the bus. The only loopguard-specific lines are the subjects:
//
//	publish to   chat.raw.<world>.agent.<name>   (its raw output)
//	read from    chat.private.<world>.<name>     (what it should act on)
//	announce on  chat.join.<world>.<name>        (puts it on the roster)
//
// (`chat` is loopguard's `nats.prefix`: -prefix when it runs with another.)
//
//	go mod tidy && go run . -world demo -name alice -peer bob
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// loopguard forgets an agent that only listens after `state.idle_seconds`
// (an hour by default), and all of its roster on a restart: the agent joins
// again this often (keep it below `state.idle_seconds`), and whenever its
// connection comes back.
const joinEvery = 10 * time.Minute

// Message is what loopguard delivers (docs/CONTRACT.md §4); fields this
// agent does not read are left out.
type Message struct {
	ID         string
	Content    string
	Sender     string
	SenderKind string
	ThreadID   string
	Depth      int
	Visibility string
}

// UnmarshalJSON reads loopguard's keys exactly as named. encoding/json
// matches keys in any case, and a copy keeps the sender's other fields as
// written, so a human's "ID" or "Content" would stand in for loopguard's.
func (m *Message) UnmarshalJSON(data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return err
	}
	for key, into := range map[string]any{
		"id":          &m.ID,
		"content":     &m.Content,
		"sender":      &m.Sender,
		"sender_kind": &m.SenderKind,
		"thread_id":   &m.ThreadID,
		"depth":       &m.Depth,
		"visibility":  &m.Visibility,
	} {
		if raw, ok := fields[key]; ok {
			if err := json.Unmarshal(raw, into); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	return nil
}

// Reply is what the agent publishes: its content, and the message it
// answers, so loopguard counts the reply chain's depth.
type Reply struct {
	Content  string `json:"content"`
	ParentID string `json:"parent_id"`
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// prefixRe is loopguard's `nats.prefix`: one or more dot-separated tokens
// of the same characters (a `*`, `>` or space would make a wildcard or bad
// subject).
var prefixRe = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// passRe is the text loopguard hands the world back to a human for, in any
// case.
var passRe = regexp.MustCompile(`(?i)<world>pass</world>`)

// quote is the first 60 characters of text (not bytes: a cut through a
// multi-byte character would leave a replacement character where
// json.Marshal met it), on one line and without the pass tag: quoted as
// they came, a newline then `@carol` would address the reply to carol too,
// and a quoted tag would make it a hand-back.
func quote(text string) string {
	line := strings.Join(strings.Fields(text), " ")
	for passRe.MatchString(line) {
		line = passRe.ReplaceAllString(line, "")
	}
	runes := []rune(line)
	if len(runes) > 60 {
		runes = runes[:60]
	}
	return string(runes)
}

// canonical is a world or agent name as loopguard reads it (contract §1): it
// lowercases the token, which must then be 1-64 of a-z, 0-9, _ and -.
// Inboxes are named in that form, and NATS subjects are case-sensitive, so
// an agent started as "Alice" would listen on an inbox loopguard never
// writes to.
func canonical(flagName, name string) (string, error) {
	if !nameRe.MatchString(name) {
		return "", fmt.Errorf("-%s %q: a name is 1-64 of a-z, 0-9, '_' and '-'", flagName, name)
	}
	return strings.ToLower(name), nil
}

// usage reports a bad command line as the flag package does: the message,
// the usage, exit status 2.
func usage(err error) {
	fmt.Fprintln(flag.CommandLine.Output(), err)
	flag.Usage()
	os.Exit(2)
}

func main() {
	log.SetFlags(0)
	url := flag.String("url", "nats://127.0.0.1:4222", "NATS server URL")
	worldFlag := flag.String("world", "demo", "world (conversation) to speak in")
	nameFlag := flag.String("name", "", "this agent's name (required)")
	peerFlag := flag.String("peer", "", "the agent to answer (required)")
	prefix := flag.String("prefix", "chat", "loopguard's nats.prefix")
	flag.Parse()
	if flag.NArg() > 0 {
		usage(fmt.Errorf("unexpected arguments: %q", flag.Args()))
	}
	if *nameFlag == "" || *peerFlag == "" {
		usage(fmt.Errorf("-name and -peer are required"))
	}
	mustName := func(flagName, value string) string {
		n, err := canonical(flagName, value)
		if err != nil {
			usage(err)
		}
		return n
	}
	world := mustName("world", *worldFlag)
	name := mustName("name", *nameFlag)
	peer := mustName("peer", *peerFlag)
	if !prefixRe.MatchString(*prefix) {
		usage(fmt.Errorf("-prefix %q: dot-separated tokens of A-Z, a-z, 0-9, '_' and '-'", *prefix))
	}

	raw := fmt.Sprintf("%s.raw.%s.agent.%s", *prefix, world, name)
	join := fmt.Sprintf("%s.join.%s.%s", *prefix, world, name)
	inbox := fmt.Sprintf("%s.private.%s.%s", *prefix, world, name)

	closed := make(chan struct{})
	nc, err := nats.Connect(*url,
		nats.Name("loopguard-example-"+name),
		nats.MaxReconnects(-1),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		// A full `messages` channel drops what comes next (a slow
		// consumer): said, not silent.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Printf("%s: %v", name, err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			// loopguard may have restarted meanwhile, its roster empty.
			_ = nc.Publish(join, nil)
		}))
	if err != nil {
		log.Fatalf("%s: cannot connect to %s: %v", name, *url, err)
	}
	messages := make(chan *nats.Msg, 256)
	if _, err := nc.ChanSubscribe(inbox, messages); err != nil {
		log.Fatalf("%s: cannot subscribe to %s: %v", name, inbox, err)
	}
	if err := nc.Publish(join, nil); err != nil {
		log.Fatalf("%s: cannot join: %v", name, err)
	}
	// The server holds the subscription and has the join once this returns.
	if err := nc.Flush(); err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	fmt.Printf("%s: listening on %s, publishing to %s\n", name, inbox, raw)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	rejoin := time.NewTicker(joinEvery)
	defer rejoin.Stop()
	n := 0
	for {
		select {
		case m := <-messages:
			var message Message
			if err := json.Unmarshal(m.Data, &message); err != nil {
				log.Printf("%s: not a loopguard message on %s: %v", name, m.Subject, err)
				continue
			}
			n++
			reply, _ := json.Marshal(Reply{
				Content:  fmt.Sprintf("@%s %s replies (#%d) to: %s", peer, name, n, quote(message.Content)),
				ParentID: message.ID,
			})
			if err := nc.Publish(raw, reply); err != nil {
				log.Printf("%s: cannot publish: %v", name, err)
			}
		case <-rejoin.C:
			_ = nc.Publish(join, nil)
		case <-closed:
			// The server ended the connection for good (an error it
			// will not reconnect after): an agent that cannot hear.
			log.Fatalf("%s: connection closed: %v", name, nc.LastError())
		case <-stop:
			// A second signal takes its default action: ends at once.
			signal.Stop(stop)
			// Drain returns at once; the connection closes once what is
			// published has reached the server (within its 30 s drain
			// timeout). Messages still in `messages` are dropped.
			if err := nc.Drain(); err != nil {
				log.Printf("%s: %v", name, err)
				return
			}
			<-closed
			return
		}
	}
}
