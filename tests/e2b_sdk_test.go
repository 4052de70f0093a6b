//go:build integration

package tests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
)

// e2bPools serves E2B's default template ("base" is the default pool).
const e2bPools = `pools:
  - name: default
    image: host
    min_warm: 4
    max_total: 24
`

// e2bDomain is the wildcard domain of the host-routing runs: every name
// under .localhost resolves to the loopback address (nss-myhostname,
// which make test installs), so the SDK's https://49983-{id}.e2b.localhost
// reaches the gateway with no resolver file edited.
const e2bDomain = "e2b.localhost"

// The unmodified e2b SDK, at each pinned version (scripts/e2b-sdk.sh), runs
// tests/e2b/sdk_suite.py (sync and async) against a gateway, pointed at it
// by E2B's environment variables only: once routed by E2B's headers
// (E2B_SANDBOX_URL), once by host (E2B_DOMAIN, over TLS with a test CA).
func TestE2B_SDK(t *testing.T) {
	pythons := testenv.E2BPythons(t)
	versions := make([]string, 0, len(pythons))
	for v := range pythons {
		versions = append(versions, v)
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[i], versions[j]) })
	for _, v := range versions {
		py := pythons[v]
		t.Run(v+"/headers", func(t *testing.T) {
			key := e2bKey(t)
			g := startGateway(t, e2bPools, withKey(key))
			g.waitReady("default", 2)
			runE2BSuite(t, py, v, "headers", g,
				"E2B_API_URL="+g.url(), "E2B_SANDBOX_URL="+g.url(), "E2B_API_KEY="+key)
		})
		t.Run(v+"/hosts", func(t *testing.T) {
			requireLoopbackName(t, "49983-probe."+e2bDomain)
			key := e2bKey(t)
			dir := t.TempDir()
			caFile, certFile, keyFile, hc := e2bTestCA(t, dir)
			addr := freeAddr(t)
			_, port, err := net.SplitHostPort(addr)
			require.NoError(t, err)
			domain := e2bDomain + ":" + port
			g := startGateway(t, e2bPools, withKey(key), withAddr(addr), withTLS(certFile, keyFile, hc),
				withEnv("QUARRY_E2B_DOMAIN="+domain))
			g.waitReady("default", 2)
			runE2BSuite(t, py, v, "hosts", g,
				"E2B_API_URL=https://"+domain, "E2B_DOMAIN="+domain, "E2B_API_KEY="+key, "SSL_CERT_FILE="+caFile)
		})
	}
}

// The newest pinned SDK on the Docker provider, routed by headers: the
// same suite in containers of an image with bash, pause (a frozen
// container) and resume, and a full disk (a pool whose work directory
// holds 25 MiB) is NotEnoughSpaceException.
func TestE2B_SDK_Docker(t *testing.T) {
	pythons := testenv.E2BPythons(t)
	newest := ""
	for v := range pythons {
		if newest == "" || versionLess(newest, v) {
			newest = v
		}
	}
	d := requireDocker(t)
	key := e2bKey(t)
	g := d.startGateway(fmt.Sprintf(`pools:
  - name: default
    image: %[1]s
    cpu: 0.5
    memory: 256Mi
    min_warm: 2
    max_total: 12
  - name: small
    image: %[1]s
    memory: 64Mi
    disk: 25Mi
    min_warm: 1
    max_total: 2
`, dockerImageBash), withKey(key))
	g.waitReady("default", 2)
	g.waitReady("small", 1)
	runE2BSuite(t, pythons[newest], newest, "headers", g,
		"E2B_API_URL="+g.url(), "E2B_SANDBOX_URL="+g.url(), "E2B_API_KEY="+key, "QUARRY_E2B_SMALL_DISK_TEMPLATE=small", "QUARRY_E2B_PAUSE=1")
}

// versionLess compares dotted versions numerically (2.9.0 < 2.31.0).
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

// runE2BSuite runs tests/e2b/sdk_suite.py with py and env (E2B's variables)
// and fails t with its output when a test fails, or is skipped for another
// reason than a method this SDK version does not have (or, routed by
// headers, signed URLs: they name no sandbox there).
func runE2BSuite(t *testing.T, py, version, routing string, g *gatewayProc, env ...string) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, py, "e2b/sdk_suite.py")
	cmd.Env = append(e2bCleanEnv(), env...)
	cmd.Env = append(cmd.Env, "QUARRY_E2B_TEMPLATE=base", "QUARRY_E2B_ROUTING="+routing)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	require.NoError(t, err, "e2b %s (%s) failed:\n%s", version, routing, out.String())
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests?`).FindStringSubmatch(out.String())
	require.NotNil(t, ran, "no unittest summary:\n%s", out.String())
	for _, line := range strings.Split(out.String(), "\n") {
		skip, ok := strings.CutPrefix(line, "SKIP ")
		if !ok {
			continue
		}
		allowed := strings.Contains(skip, ": not in e2b "+version) ||
			routing == "headers" && strings.Contains(skip, "test_signed_urls") ||
			!slices.Contains(env, "QUARRY_E2B_SMALL_DISK_TEMPLATE=small") && strings.Contains(skip, "test_full_disk")
		require.True(t, allowed, "a skip that is not a missing SDK method: %s\n%s", skip, out.String())
		t.Logf("skipped: %s", skip)
	}
	t.Logf("e2b %s, routed by %s: %s tests ran, every one passed or was skipped as logged", version, routing, ran[1])
}

// e2bCleanEnv is the test's environment without E2B's variables, so that a
// developer's own E2B settings never reach the suite.
func e2bCleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "SSL_CERT_") {
			env = append(env, kv)
		}
	}
	return env
}

// e2bKey is an API key of the shape the SDK checks (^e2b_[0-9a-f]+$).
func e2bKey(t *testing.T) string {
	sum := sha256.Sum256([]byte(t.Name()))
	return "e2b_" + hex.EncodeToString(sum[:20])
}

// requireLoopbackName fails t unless name resolves to the loopback address.
func requireLoopbackName(t *testing.T, name string) {
	t.Helper()
	addrs, err := net.DefaultResolver.LookupHost(context.Background(), name)
	require.NoError(t, err, "%s must resolve to the loopback address: make test installs libnss-myhostname (apt-get install libnss-myhostname)", name)
	for _, a := range addrs {
		require.True(t, net.ParseIP(a).IsLoopback(), "%s resolves to %s, not the loopback address", name, a)
	}
}

// e2bTestCA writes a test CA and a certificate it signed for e2bDomain and
// *.e2bDomain into dir, and returns their files and a client that trusts
// the CA. (A self-signed leaf is refused by rustls, which the newest SDK's
// transport uses.)
func e2bTestCA(t *testing.T, dir string) (caFile, certFile, keyFile string, hc *http.Client) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "quarry e2b test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: e2bDomain},
		DNSNames:    []string{e2bDomain, "*." + e2bDomain},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, caKey)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(leafKey)
	require.NoError(t, err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	caFile = write("ca.pem", "CERTIFICATE", caDER)
	certFile = write("cert.pem", "CERTIFICATE", leafDER)
	keyFile = write("key.pem", "EC PRIVATE KEY", kb)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return caFile, certFile, keyFile, hc
}
