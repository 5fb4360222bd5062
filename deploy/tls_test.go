package deploy_test

// TLS (deploy/README.md#tls): nats/tls/mkcerts.sh makes a CA and the
// certificates the configs read from /etc/nats-tls/; a server loaded with
// them requires TLS of every client and a certificate of the CA of every
// route. The other tests run on certificates of the same names that
// proctest makes in Go (proctest.Certs).

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
)

// mkcerts runs nats/tls/mkcerts.sh into dir with env added.
func mkcerts(t *testing.T, dir string, env ...string) {
	t.Helper()
	cmd := exec.Command("sh", filepath.Join("nats", "tls", "mkcerts.sh"), dir)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkcerts.sh: %v\n%s", err, out)
	}
}

func TestTLSScript(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("openssl is missing: .ci/run installs it")
		}
		t.Skip("openssl is missing: skipped (.ci/run installs it; CI fails without it)")
	}
	dir := filepath.Join(t.TempDir(), "tls")
	mkcerts(t, dir, "NATS_TLS_NAMES=nats.example.com 10.0.0.5")

	// The files the configs and proctest name, keys readable by the owner only.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o644)
		if strings.HasSuffix(e.Name(), "-key.pem") {
			want = 0o600
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", e.Name(), info.Mode().Perm(), want)
		}
	}
	want := slices.Clone(proctest.TLSFiles)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("mkcerts.sh wrote %v, want %v", names, want)
	}

	// Each certificate chains to the CA for the names of every topology
	// (and those of NATS_TLS_NAMES), with its usage: the route's for both
	// ends of a route.
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(readBytes(t, filepath.Join(dir, "ca.pem"))) {
		t.Fatal("ca.pem holds no certificate")
	}
	for file, usages := range map[string][]x509.ExtKeyUsage{
		"server.pem": {x509.ExtKeyUsageServerAuth},
		"route.pem":  {x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	} {
		cert := parseCert(t, filepath.Join(dir, file))
		for _, usage := range usages {
			for _, host := range []string{"localhost", "127.0.0.1", "::1", "nats", "nats-3", "nats.dispatch.svc",
				"nats-0.nats-headless", "nats-2.nats-headless.dispatch.svc.cluster.local", "nats.example.com", "10.0.0.5"} {
				if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("%s for %s (usage %v): %v", file, host, usage, err)
				}
			}
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "nats.elsewhere.example"}); err == nil {
			t.Errorf("%s is valid for a name it was not made for", file)
		}
	}

	// A second run keeps the CA and issues new certificates: clients keep
	// their ca.pem.
	ca, srv := readBytes(t, filepath.Join(dir, "ca.pem")), readBytes(t, filepath.Join(dir, "server.pem"))
	mkcerts(t, dir)
	if !bytes.Equal(ca, readBytes(t, filepath.Join(dir, "ca.pem"))) || bytes.Equal(srv, readBytes(t, filepath.Join(dir, "server.pem"))) {
		t.Error("a second run did not keep the CA and issue a new server certificate")
	}

	t.Run("clients", func(t *testing.T) { testClientTLS(t, dir) })
	t.Run("routes", func(t *testing.T) { testRouteTLS(t, dir) })
}

// testClientTLS: single.conf with the certificates of dir. A client that
// trusts dir's CA connects; one that trusts another CA, or speaks no TLS,
// does not.
func testClientTLS(t *testing.T, dir string) {
	pw := proctest.SetPasswords(t)
	opts, err := server.ProcessConfigFile(proctest.ConfCopy(t, filepath.Join("nats", "single.conf"), dir))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns := startServer(t, opts)

	nc, err := nats.Connect(ns.ClientURL(), nats.RootCAs(filepath.Join(dir, "ca.pem")), nats.UserInfo("admin", pw["admin"]))
	if err != nil {
		t.Fatalf("admin, trusting mkcerts.sh's CA: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("the server does not require TLS")
	}
	nc.Close()

	var unknown *tls.CertificateVerificationError
	if _, err := nats.Connect(ns.ClientURL(), clientTLS(t), nats.UserInfo("admin", pw["admin"])); !errors.As(err, &unknown) {
		t.Errorf("admin, trusting another CA: %v, want a certificate verification error", err)
	}

	// Without TLS: the server announces it requires TLS and hangs up on a
	// plain CONNECT, password and all, without an answer.
	conn, err := net.Dial("tcp", ns.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(patience)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(info, "INFO ") || !strings.Contains(info, `"tls_required":true`) {
		t.Fatalf("first line %q (%v), want an INFO with tls_required", info, err)
	}
	if _, err := conn.Write([]byte(`CONNECT {"verbose":false,"user":"admin","pass":"` + pw["admin"] + "\"}\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	var timeout net.Error
	if errors.As(err, &timeout) && timeout.Timeout() {
		t.Fatalf("the server kept a plain connection open: %q", rest)
	}
	if bytes.Contains(rest, []byte("PONG")) || bytes.Contains(rest, []byte("+OK")) {
		t.Fatalf("the server answered a plain CONNECT: %q", rest)
	}
}

// testRouteTLS: node 1 of the cluster with the certificates of dir, alone.
// Its route port completes a handshake only with a certificate of dir's
// CA: route.pem. Without one, or with another CA's, it hangs up.
func testRouteTLS(t *testing.T, dir string) {
	proctest.SetPasswords(t)
	opts, err := server.ProcessConfigFile(proctest.ConfCopy(t, filepath.Join("nats", "cluster", "node-1.conf"), dir))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.Cluster.Host, opts.Cluster.Port, opts.Routes = "127.0.0.1", -1, nil
	opts.JetStream, opts.StoreDir = false, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns := startServer(t, opts)
	addr := ns.ClusterAddr().String()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(readBytes(t, filepath.Join(dir, "ca.pem")))
	// route dials the route port presenting certs and returns the server's
	// first line after the handshake, or the error.
	route := func(certs []tls.Certificate) (string, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: patience}, "tcp", addr,
			&tls.Config{RootCAs: roots, ServerName: "nats-1", Certificates: certs, MinVersion: tls.VersionTLS12})
		if err != nil {
			return "", err
		}
		defer conn.Close()
		if err := conn.SetDeadline(time.Now().Add(patience)); err != nil {
			return "", err
		}
		return bufio.NewReader(conn).ReadString('\n')
	}
	pair := func(dir string) []tls.Certificate {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "route.pem"), filepath.Join(dir, "route-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{cert}
	}
	if line, err := route(pair(dir)); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("a route presenting route.pem: %q, %v; want the node's INFO", line, err)
	}
	for name, certs := range map[string][]tls.Certificate{"no certificate": nil, "another CA's route.pem": pair(proctest.Certs(t))} {
		line, err := route(certs)
		var timeout net.Error
		if err == nil || (errors.As(err, &timeout) && timeout.Timeout()) {
			t.Errorf("a route presenting %s: %q, %v; want the handshake refused", name, line, err)
		}
	}
}

func readBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(readBytes(t, path), readBytes(t, strings.TrimSuffix(path, ".pem")+"-key.pem"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Every manifest connects with TLS and mounts what its side needs: each
// NATS server its certificates and keys, each service (and the provision
// step) the CA alone. The CA's key is mounted nowhere.
func TestTLSInManifests(t *testing.T) {
	for _, f := range yamlFiles(t) {
		for i, line := range strings.Split(readFile(t, f), "\n") {
			if l := strings.TrimSpace(line); strings.Contains(l, "ca-key.pem") && !strings.HasPrefix(l, "#") {
				t.Errorf("%s:%d mounts the CA's key: %s", f, i+1, l)
			}
		}
	}

	// Kubernetes: the nats-tls Secret; a service gets its ca.pem only.
	for _, name := range append(slices.Clone(stageServices), "web", "provision-job") {
		text := readFile(t, filepath.Join("k8s", name+".yaml"))
		for _, want := range []string{
			"name: DISPATCH_NATS_URL\n              value: tls://nats:4222\n",
			"name: DISPATCH_NATS_CA\n              value: /etc/nats-tls/ca.pem\n",
			"- name: nats-ca\n              mountPath: /etc/nats-tls\n              readOnly: true\n",
			"secretName: nats-tls\n            items:\n              - key: ca.pem\n                path: ca.pem\n            defaultMode: 0444\n",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("k8s/%s.yaml lacks %q", name, want)
			}
		}
		if strings.Contains(text, "-key.pem") {
			t.Errorf("k8s/%s.yaml mounts a key", name)
		}
	}
	sts := readFile(t, filepath.Join("k8s", "nats.yaml"))
	want := "- name: tls\n              mountPath: /etc/nats-tls\n              readOnly: true\n"
	for _, f := range []string{"ca.pem", "server.pem", "server-key.pem", "route.pem", "route-key.pem"} {
		if !strings.Contains(sts, "- key: "+f+"\n                path: "+f+"\n") {
			t.Errorf("k8s/nats.yaml does not mount %s of the nats-tls Secret", f)
		}
	}
	if !strings.Contains(sts, want) || !strings.Contains(sts, "secretName: nats-tls") {
		t.Errorf("k8s/nats.yaml does not mount the nats-tls Secret at /etc/nats-tls")
	}

	// Compose: tls/ beside the compose files (mkcerts.sh tls).
	mount := func(file string) string {
		return "{ type: bind, source: ./tls/" + file + ", target: /etc/nats-tls/" + file + ", read_only: true, bind: { create_host_path: false } }"
	}
	compose := readFile(t, filepath.Join("docker", "compose.yaml"))
	for _, want := range []string{
		"DISPATCH_NATS_URL: tls://nats:4222\n", "DISPATCH_NATS_CA: /etc/nats-tls/ca.pem\n",
		"- &ca-cert " + mount("ca.pem"), "- " + mount("server.pem"), "- " + mount("server-key.pem"),
	} {
		if !strings.Contains(compose, want) {
			t.Errorf("compose.yaml lacks %q", want)
		}
	}
	cluster := readFile(t, filepath.Join("docker", "compose.cluster.yaml"))
	for _, f := range []string{"server", "server-key", "route", "route-key", "ca"} {
		if !strings.Contains(cluster, "&tls-"+f+" "+mount(f+".pem")) || strings.Count(cluster, "- *tls-"+f+"\n") != 3 {
			t.Errorf("compose.cluster.yaml does not mount %s.pem on each of the three nodes", f)
		}
	}
}
