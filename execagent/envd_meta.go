package execagent

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/sys/unix"
)

// envd's file metadata (envd 0.6.2): an upload's X-Metadata-<key>: <value>
// headers are kept as extended attributes user.e2b.<key> of the file, and
// every EntryInfo (Stat, ListDir, Move, MakeDir, upload answers) carries
// them in metadata. A file system without user xattrs (some tmpfs) keeps
// the file and drops the metadata, as envd does.

const (
	// metadataHeader prefixes an upload's metadata headers.
	metadataHeader = "X-Metadata-"
	// metadataXattr prefixes the metadata's extended attributes.
	metadataXattr = "user.e2b."
	// maxMetadataKey is the longest key (the xattr name limit, 255, less
	// the prefix); maxMetadataTotal bounds a file's keys, prefixes and
	// values together.
	maxMetadataKey   = 255 - len(metadataXattr)
	maxMetadataTotal = 4096
)

// uploadMetadata reads and checks the metadata headers of an upload (nil:
// none): keys lowercased, the first value of a key repeated, printable
// ASCII only, within maxMetadataKey and maxMetadataTotal.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for name, values := range h {
		key, ok := strings.CutPrefix(name, metadataHeader)
		if !ok || key == "" || len(values) == 0 {
			continue
		}
		key = strings.ToLower(key)
		v := values[0]
		switch {
		case len(key) > maxMetadataKey:
			return nil, invalid(name, "the metadata key is over %d bytes", maxMetadataKey)
		case !printableASCII(key) || !printableASCII(v):
			return nil, invalid(name, "metadata keys and values are printable ASCII only")
		}
		total += len(metadataXattr) + len(key) + len(v)
		if total > maxMetadataTotal {
			return nil, invalid(name, "a file's metadata (keys, values and %d bytes per key) is over %d bytes", len(metadataXattr), maxMetadataTotal)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = v
	}
	return md, nil
}

func printableASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// writeMetadata sets md on the file p, which a rename just put in place
// (a new inode: metadata of the file it replaced is gone, as envd replaces
// it). Without user xattrs on p's file system the metadata is dropped; a
// full disk is 507.
func writeMetadata(p string, md map[string]string) error {
	for k, v := range md {
		err := unix.Setxattr(p, metadataXattr+k, []byte(v), 0)
		switch {
		case err == nil:
		case errors.Is(err, unix.ENOTSUP):
			return nil
		case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
			return diskFull(p, err)
		default:
			return fmt.Errorf("set metadata %q of %q: %w", k, p, err)
		}
	}
	return nil
}

// readMetadata returns the metadata of p (nil: none, or unreadable). A
// file without extended attributes costs one system call.
func readMetadata(p string) map[string]string {
	n, err := unix.Listxattr(p, nil)
	if err != nil || n <= 0 {
		return nil
	}
	buf := make([]byte, n)
	if n, err = unix.Listxattr(p, buf); err != nil {
		return nil
	}
	var md map[string]string
	val := make([]byte, maxMetadataTotal)
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, metadataXattr)
		if !ok || key == "" {
			continue
		}
		m, err := unix.Getxattr(p, name, val)
		if err != nil { // gone meanwhile, or longer than any metadata the agent writes
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val[:m])
	}
	return md
}
