// Command webhook is a receiver of dispatchmesh's completion webhooks, in
// the standard library only: it checks each POST's Dispatch-Signature
// (HMAC-SHA256 over "<t>.<delivery id>.<body>" under the shared secret, and a timestamp
// within 5 minutes), answers 204 at once, and handles each delivery id
// once — the mesh delivers at least once, so the same id may come again.
//
//	WEBHOOK_SECRET=... LISTEN=127.0.0.1:8099 go run ./examples/go/webhook
//
// See docs/api.md#webhooks.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

const tolerance = 5 * time.Minute

// verify checks header (t=<unix>,v1=<hex>[,v1=...]) against the delivery
// id and body: the id is signed, so deduplicating on it is safe.
func verify(secret []byte, header, delivery string, body []byte, now time.Time) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return errors.New("malformed signature header")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return errors.New("timestamp outside the tolerance")
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "." + delivery + "."))
	mac.Write(body)
	want := hex.EncodeToString(mac.Sum(nil))
	for _, s := range sigs {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return errors.New("no signature matches")
}

func main() {
	secret := []byte(os.Getenv("WEBHOOK_SECRET"))
	listen := os.Getenv("LISTEN")
	if len(secret) == 0 || listen == "" {
		log.Fatal("set WEBHOOK_SECRET and LISTEN")
	}
	var mu sync.Mutex
	seen := map[string]bool{} // a real receiver keeps this in its database
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		id := r.Header.Get("Dispatch-Delivery")
		if err := verify(secret, r.Header.Get("Dispatch-Signature"), id, body, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var answer struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(body, &answer); err != nil {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		mu.Lock()
		first := !seen[id]
		seen[id] = true
		mu.Unlock()
		if first { // handle it once; a repeat is acknowledged, not redone
			fmt.Printf("delivery %s: task %s %s\n", id, answer.ID, answer.Status)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	log.Fatal(http.ListenAndServe(listen, nil))
}
