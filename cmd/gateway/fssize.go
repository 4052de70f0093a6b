package main

import "golang.org/x/sys/unix"

// fileSystemSize returns the size in bytes of the file system holding
// dir.
func fileSystemSize(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks) * int64(st.Bsize), nil // the fields' types differ by OS
}
