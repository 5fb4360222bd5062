package client_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
)

// Receive the outcome of a task submitted with a CallbackURL: verify the
// signature, deduplicate on the delivery id, answer 2xx at once.
func ExampleReadWebhook() {
	secret := []byte("the DISPATCH_WEBHOOK_SECRET of the mesh")
	seen := map[string]bool{} // a real receiver keeps these in its database
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		outcome, delivery, err := client.ReadWebhook(r, secret)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if !seen[delivery] {
			seen[delivery] = true
			fmt.Printf("task %s %s\n", outcome.ID, outcome.Status)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()

	// What the webhook service sends, twice (delivery is at least once),
	// then a forgery.
	body := []byte(`{"id":"t-1","type":"css_fix","subject":"a.css","status":"succeeded","terminal":true}`)
	send := func(sig string) int {
		req, _ := http.NewRequest(http.MethodPost, receiver.URL, bytes.NewReader(body))
		req.Header.Set(client.SignatureHeader, sig)
		req.Header.Set(client.DeliveryHeader, "whd_0123456789abcdef01234567")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println(send(events.SignWebhook(secret, time.Now(), "whd_0123456789abcdef01234567", body)))
	fmt.Println(send(events.SignWebhook(secret, time.Now(), "whd_0123456789abcdef01234567", body)))
	fmt.Println(send(events.SignWebhook([]byte("not the secret"), time.Now(), "whd_0123456789abcdef01234567", body)))
	// Output:
	// task t-1 succeeded
	// 204
	// 204
	// 401
}
