package proctest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TLSDir is where the NATS configs of deploy/ read their TLS files, which
// deploy/nats/tls/mkcerts.sh makes. Tests put theirs elsewhere (ConfCopy).
const TLSDir = "/etc/nats-tls/"

// TLSFiles are the files mkcerts.sh writes, under the same names: the CA
// and its key, the certificate clients see and the one the cluster's
// routes present to each other, with their keys.
var TLSFiles = []string{"ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "route.pem", "route-key.pem"}

type certSet struct {
	files map[string][]byte
	pool  *x509.CertPool
}

// testCerts are made once per test binary: a CA, and a server and a route
// certificate for localhost, 127.0.0.1 and ::1.
var testCerts = sync.OnceValues(func() (*certSet, error) {
	caKey, caPEM, ca, err := issue(nil, nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "dispatchmesh test CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	})
	if err != nil {
		return nil, err
	}
	set := &certSet{files: map[string][]byte{"ca.pem": caPEM}, pool: x509.NewCertPool()}
	set.pool.AddCert(ca)
	if set.files["ca-key.pem"], err = keyPEM(caKey); err != nil {
		return nil, err
	}
	for name, usage := range map[string][]x509.ExtKeyUsage{
		"server": {x509.ExtKeyUsageServerAuth},
		"route":  {x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	} {
		key, certPEM, _, err := issue(ca, caKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "dispatchmesh NATS " + name},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: usage,
		})
		if err != nil {
			return nil, err
		}
		set.files[name+".pem"] = certPEM
		if set.files[name+"-key.pem"], err = keyPEM(key); err != nil {
			return nil, err
		}
	}
	return set, nil
})

// issue makes a P-256 key and a certificate of tmpl for it, signed by
// parent (self-signed when parent is nil), valid for a day.
func issue(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*ecdsa.PrivateKey, []byte, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)); err != nil {
		return nil, nil, nil, err
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert, nil
}

func keyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func certs(t testing.TB) *certSet {
	t.Helper()
	set, err := testCerts()
	if err != nil {
		t.Fatalf("test certificates: %v", err)
	}
	return set
}

// Certs writes the TLSFiles of a test CA into a new temporary directory
// and returns it. Every call of a test binary writes the same CA, which
// CAPool trusts.
func Certs(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range certs(t).files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, "-key.pem") {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// CAPool trusts the CA of Certs: a client of a server started with them
// connects with tls.Config{RootCAs: CAPool(t)}.
func CAPool(t testing.TB) *x509.CertPool {
	t.Helper()
	return certs(t).pool
}

// ConfCopy copies the config directory that holds path (the nearest one,
// from path's own up, with a users.conf: deploy/nats for
// cluster/node-1.conf) into a new temporary directory, naming the TLS files
// of certDir ("": Certs) instead of TLSDir in every .conf, and returns the
// copy of path. nats-server loads a config's TLS files while it parses it,
// so a config of deploy/ parses only where its TLS files are.
func ConfCopy(t testing.TB, path, certDir string) string {
	t.Helper()
	if certDir == "" {
		certDir = Certs(t)
	}
	path, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(path)
	for {
		if _, err := os.Stat(filepath.Join(root, "users.conf")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatalf("%s: no users.conf beside it or above", path)
		}
		root = parent
	}
	dir := t.TempDir()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".conf") {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		text := strings.ReplaceAll(readFile(t, p), TLSDir, filepath.Clean(certDir)+string(filepath.Separator))
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, rel)), 0o700); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), []byte(text), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, rel)
}
