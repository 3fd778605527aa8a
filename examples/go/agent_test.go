package main

import (
	"encoding/json"
	"testing"
)

// A copy keeps a sender's other fields as written: "ID" or "Content" in
// another case must not stand in for loopguard's "id" and "content", nor
// make the copy unreadable.
func TestMessageReadsLoopguardKeysExactly(t *testing.T) {
	// loopguard's keys come first in a copy, the sender's after.
	for _, body := range []string{
		`{"id":"m1","content":"hi","depth":2,"ID":"forged","Content":"other"}`,
		`{"id":"m1","content":"hi","depth":2,"ID":5,"Content":["x"]}`,
	} {
		var m Message
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if m.ID != "m1" || m.Content != "hi" || m.Depth != 2 {
			t.Fatalf("%s: read as %+v", body, m)
		}
	}
}
