#!/bin/sh
# dispatchmesh — a self-signed CA and the NATS server's certificates.
#
#   deploy/nats/tls/mkcerts.sh DIR
#
# e.g. DIR deploy/docker/tls for compose (git-ignored there), a scratch
# directory for the k8s Secret nats-tls, /etc/nats-tls on a host (then move
# ca-key.pem away). deploy/README.md#tls says how each topology mounts them.
# Writes into DIR (the names the configs read under /etc/nats-tls/):
#   ca.pem            the CA: every client and every node trusts it (public)
#   ca-key.pem        the CA's key: stays with the operator, is mounted nowhere
#   server.pem        what clients see on 4222 (serverAuth)
#   server-key.pem
#   route.pem         what the cluster's nodes present to each other on 6222
#   route-key.pem     (serverAuth and clientAuth: routes verify both ends)
# Keys are ECDSA P-256, mode 0600; certificates mode 0644. An existing
# ca.pem and ca-key.pem in DIR are reused, so the server certificates can be
# re-issued (new names, expiry) without handing clients a new CA; delete
# both to start a new CA.
#
# Names the certificates hold (subjectAltName), for every shipped topology:
#   localhost 127.0.0.1 ::1                       clients on the host
#   nats                                          compose service, k8s Service
#   nats-1 nats-2 nats-3                          deploy/nats/cluster, compose.cluster.yaml
#   nats.dispatch nats.dispatch.svc nats.dispatch.svc.cluster.local
#   *.nats-headless *.nats-headless.dispatch.svc[.cluster.local]   k8s routes
# Add more with NATS_TLS_NAMES (space-separated DNS names or IP addresses):
#   NATS_TLS_NAMES="nats.example.com 10.0.0.5" deploy/nats/tls/mkcerts.sh DIR
# Validity: NATS_TLS_DAYS (default 825) for the server certificates, 3650
# for the CA. Needs openssl (1.1.1 or later).
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR  (e.g. deploy/docker/tls; see deploy/README.md#tls)" >&2
  exit 2
fi
dir=$1
days=${NATS_TLS_DAYS:-825}
names="localhost 127.0.0.1 ::1 nats nats-1 nats-2 nats-3 nats.dispatch nats.dispatch.svc
nats.dispatch.svc.cluster.local *.nats-headless *.nats-headless.dispatch.svc
*.nats-headless.dispatch.svc.cluster.local ${NATS_TLS_NAMES:-}"

mkdir -p "$dir"
cd "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

san=""
set -f # the wildcard names are names, not file patterns
for n in $names; do
  case $n in
    *:*) kind=IP ;;          # IPv6
    *[!0-9.]*) kind=DNS ;;
    *) kind=IP ;;            # IPv4
  esac
  san="${san:+$san,}$kind:$n"
done
set +f

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -f ca.pem ] || [ ! -f ca-key.pem ]; then
  key ca-key.pem
  openssl req -x509 -new -key ca-key.pem -sha256 -days 3650 -subj "/CN=dispatchmesh NATS CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.pem
fi

# issue NAME USAGE: NAME.pem and NAME-key.pem, signed by the CA.
issue() {
  key "$1-key.pem"
  cat >"$tmp/$1.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=$2
subjectAltName=$san
EOF
  openssl req -new -key "$1-key.pem" -subj "/CN=dispatchmesh NATS $1" -out "$tmp/$1.csr"
  openssl x509 -req -in "$tmp/$1.csr" -CA ca.pem -CAkey ca-key.pem -set_serial "0x$(openssl rand -hex 15)" \
    -sha256 -days "$days" -extfile "$tmp/$1.ext" -out "$1.pem" 2>/dev/null
}
issue server serverAuth
issue route serverAuth,clientAuth

chmod 0600 ca-key.pem server-key.pem route-key.pem
chmod 0644 ca.pem server.pem route.pem
openssl verify -CAfile ca.pem server.pem route.pem >/dev/null
echo "wrote $(pwd): ca.pem ca-key.pem server.pem server-key.pem route.pem route-key.pem"
