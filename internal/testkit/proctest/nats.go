package proctest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Users are the NATS users of deploy/nats/users.conf. The password of user u
// is read from the environment variable PasswordVar(u).
var Users = []string{"intake", "verifier", "gate", "prompt", "executor", "recorder", "reaper", "webhook", "web", "client", "auditor", "admin"}

// PasswordVar is the environment variable users.conf reads user's password from.
func PasswordVar(user string) string { return "NATS_PASSWORD_" + strings.ToUpper(user) }

// SetPasswords sets a fresh random password for every user (letters and
// digits, starting with a letter, as users.conf asks) and POD_NAME for the
// Kubernetes config, for the rest of the test.
func SetPasswords(t testing.TB) map[string]string {
	t.Helper()
	pw := make(map[string]string, len(Users))
	for _, u := range Users {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		pw[u] = "p" + hex.EncodeToString(b)
		t.Setenv(PasswordVar(u), pw[u])
	}
	t.Setenv("POD_NAME", "nats-0")
	return pw
}

// ParseConf reads a nats-server config file (its includes too), with the
// TLS files of Certs instead of TLSDir (ConfCopy).
func ParseConf(t testing.TB, path string) *server.Options {
	t.Helper()
	opts, err := server.ProcessConfigFile(ConfCopy(t, path, ""))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return opts
}

// FreePorts returns n loopback ports that were free a moment ago.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range lns {
		l.Close()
	}
	return ports
}

// ClusterNode is the options of node i (1-3) of deploy/nats/cluster as they
// are, but on loopback: its client port (-1: any), the route ports of all
// three nodes (every node lists every route, as common.conf does) and its
// store in storeDir, with the TLS files of Certs: the routes verify each
// other as common.conf says, and clients may connect with TLS (CAPool) or,
// unlike the config, without it (AllowNonTLS: the fault suite's processes
// do). The passwords must be set (SetPasswords).
func ClusterNode(t testing.TB, natsDir string, i, clientPort int, routePorts []int, storeDir string) *server.Options {
	t.Helper()
	opts := ParseConf(t, filepath.Join(natsDir, "cluster", fmt.Sprintf("node-%d.conf", i)))
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	opts.Host, opts.Port = "127.0.0.1", clientPort
	opts.HTTPPort = 0
	opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", routePorts[i-1]
	opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
	opts.StoreDir = storeDir
	opts.AllowNonTLS = true
	opts.NoSigs, opts.NoLog = true, true
	return opts
}

// NATS is a nats-server process loaded from deploy/nats/single.conf and
// users.conf as they are, but on loopback ports with its store and TLS
// files in temp dirs.
type NATS struct {
	// URL is the client URL (tls:// when the server requires TLS); Monitor
	// the monitoring port's (http://127.0.0.1:<port>), reachable here as an
	// attacker inside the host or cluster network would have it.
	URL, Monitor string
	// CA is the file of the CA that signed the server's certificate, for
	// clients (DISPATCH_NATS_CA, nats.RootCAs).
	CA   string
	Proc *Process
	bin  string
	dir  string
	port int
}

// StartNATS runs bin with natsDir's single.conf (and users.conf) on client
// port port (0: any free port), without its tls block: for tests whose
// clients (the fault suite's processes, nats.js, nats.c, the nats CLI)
// connect without the test CA (nats.js upgrades whenever a server offers
// TLS, so allow_non_tls would not do). StartNATSTLS runs it as shipped. The
// passwords must be set (SetPasswords).
func StartNATS(t testing.TB, bin, natsDir string, port int) *NATS {
	t.Helper()
	return startNATS(t, bin, natsDir, port, "", false)
}

// StartNATSTLS is StartNATS as single.conf says: every client must connect
// with TLS, trusting the CA of certDir ("": Certs; NATS.CA names it).
func StartNATSTLS(t testing.TB, bin, natsDir string, port int, certDir string) *NATS {
	t.Helper()
	return startNATS(t, bin, natsDir, port, certDir, true)
}

func startNATS(t testing.TB, bin, natsDir string, port int, certDir string, requireTLS bool) *NATS {
	t.Helper()
	if certDir == "" {
		certDir = Certs(t)
	}
	dir := t.TempDir()
	listen := "127.0.0.1:-1"
	if port > 0 {
		listen = fmt.Sprintf("127.0.0.1:%d", port)
	}
	conf := readFile(t, ConfCopy(t, filepath.Join(natsDir, "single.conf"), certDir))
	for _, r := range [][2]string{
		{"listen: 0.0.0.0:4222", "listen: " + listen},
		{"http: 127.0.0.1:8222", "http: 127.0.0.1:-1"},
		{`store_dir: "/data/jetstream"`, fmt.Sprintf("store_dir: %q", filepath.Join(dir, "jetstream"))},
	} {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("single.conf no longer has %q: update proctest", r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	if !strings.Contains(conf, filepath.Join(certDir, "server.pem")) {
		t.Fatalf("single.conf names no %sserver.pem: update proctest", TLSDir)
	}
	if !requireTLS {
		block := regexp.MustCompile(`(?ms)^tls \{\n.*?^\}\n`)
		if n := len(block.FindAllString(conf, -1)); n != 1 {
			t.Fatalf("single.conf has %d top-level tls blocks, want 1: update proctest", n)
		}
		conf = block.ReplaceAllString(conf, "# test: no TLS\n")
	}
	conf += fmt.Sprintf("\n# test: where the random ports are written\nports_file_dir: %q\n", dir)
	for name, text := range map[string]string{"single.conf": conf, "users.conf": readFile(t, filepath.Join(natsDir, "users.conf"))} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n := &NATS{bin: bin, dir: dir, port: port, CA: filepath.Join(certDir, "ca.pem")}
	n.start(t)
	return n
}

func (n *NATS) start(t testing.TB) {
	t.Helper()
	old, _ := filepath.Glob(filepath.Join(n.dir, "*.ports"))
	for _, f := range old {
		os.Remove(f)
	}
	n.Proc = Start(t, "nats-server", os.Environ(), n.bin, "-c", filepath.Join(n.dir, "single.conf"))
	var ports struct{ Nats, Monitoring []string }
	WaitFor(t, 45*time.Second, "nats-server's ports file", func() error {
		if n.Proc.Exited() {
			t.Fatalf("nats-server exited: %v\n%s", n.Proc.Err, n.Proc.Output())
		}
		files, _ := filepath.Glob(filepath.Join(n.dir, "*.ports"))
		if len(files) == 0 {
			return errors.New("no ports file")
		}
		data, err := os.ReadFile(files[0])
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &ports); err != nil || len(ports.Nats) == 0 {
			return fmt.Errorf("ports file %q: %v", data, err) // still being written
		}
		return nil
	})
	n.URL = ports.Nats[0]
	if len(ports.Monitoring) > 0 {
		n.Monitor = ports.Monitoring[0]
	}
}

// Stop stops the server with sig (SIGTERM: a clean shutdown, SIGKILL: a
// crash) and waits for it to exit.
func (n *NATS) Stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := n.Proc.Signal(sig); err != nil && !n.Proc.Exited() {
		t.Fatalf("signal nats-server: %v", err)
	}
	select {
	case <-n.Proc.Done:
	case <-time.After(45 * time.Second):
		t.Fatalf("nats-server did not exit on %v", sig)
	}
}

// Start starts a stopped server again, on the same store and (when it was
// started on a fixed port) the same port.
func (n *NATS) Start(t testing.TB) {
	t.Helper()
	url := n.URL
	n.start(t)
	if n.port > 0 && n.URL != url {
		t.Fatalf("nats-server came back on %s, not %s", n.URL, url)
	}
}

// Restart stops the server with sig and starts it again.
func (n *NATS) Restart(t testing.TB, sig syscall.Signal) {
	t.Helper()
	n.Stop(t, sig)
	n.Start(t)
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
