package examples_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
)

// TestWebhookReceivers checks the Go and Python receiver examples against
// the mesh's own signer (events.SignWebhook): a signed delivery is
// accepted and handled once however often it comes; a tampered body, a
// wrong secret and a stale timestamp are refused.
func TestWebhookReceivers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the receivers")
	}
	goBin := t.TempDir() + "/webhook"
	if out, err := exec.Command("go", "build", "-o", goBin, "./go/webhook").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	receivers := map[string][]string{"go": {goBin}}
	if tc := toolchain("python3", "python/webhook_receiver.py"); tc.missing == "" {
		receivers["python"] = []string{"python3", "python/webhook_receiver.py"}
	} else {
		t.Logf("python receiver skipped: %s missing", tc.missing)
	}
	secret := []byte("receiver-example-secret")
	for name, argv := range receivers {
		t.Run(name, func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", proctest.FreePorts(t, 1)[0])
			p := proctest.Start(t, name+" receiver", proctest.Env("WEBHOOK_SECRET="+string(secret), "LISTEN="+addr), argv...)
			body := []byte(`{"id":"t-1","type":"css_fix","subject":"a.css","status":"succeeded","terminal":true}`)
			post := func(sig string, b []byte) int {
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/hook", bytes.NewReader(b))
				req.Header.Set(events.WebhookSignatureHeader, sig)
				req.Header.Set(events.WebhookDeliveryHeader, "whd_example")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return 0
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			proctest.WaitFor(t, 30*time.Second, "the receiver to listen", func() error {
				if post("", nil) == 0 {
					return fmt.Errorf("not listening on %s", addr)
				}
				return nil
			})
			now := time.Now()
			for _, c := range []struct {
				what string
				sig  string
				body []byte
				ok   bool
			}{
				{"signed", events.SignWebhook(secret, now, "whd_example", body), body, true},
				{"the same delivery again", events.SignWebhook(secret, now.Add(time.Second), "whd_example", body), body, true},
				{"tampered body", events.SignWebhook(secret, now, "whd_example", body), append(bytes.Clone(body), ' '), false},
				{"other secret", events.SignWebhook([]byte("other"), now, "whd_example", body), body, false},
				{"stale timestamp", events.SignWebhook(secret, now.Add(-10*time.Minute), "whd_example", body), body, false},
				{"no signature", "", body, false},
				{"replayed under another delivery id", events.SignWebhook(secret, now, "whd_other", body), body, false},
			} {
				code := post(c.sig, c.body)
				if ok := code >= 200 && code < 300; ok != c.ok {
					t.Errorf("%s: answered %d, want accepted %v", c.what, code, c.ok)
				}
			}
			proctest.WaitFor(t, 10*time.Second, "the delivery handled", func() error {
				if !strings.Contains(p.Output(), "delivery whd_example: task t-1 succeeded") {
					return fmt.Errorf("output %q", p.Output())
				}
				return nil
			})
			handled := 0
			for sc := bufio.NewScanner(strings.NewReader(p.Output())); sc.Scan(); {
				if strings.HasPrefix(sc.Text(), "delivery ") {
					handled++
				}
			}
			if handled != 1 {
				t.Errorf("handled %d times, want once (deduplicated on the delivery id)", handled)
			}
		})
	}
}
