package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/quarryhq/quarry/client"
)

// splitRemote splits "ID:PATH" (scp style: a colon before any slash). A
// remote path left empty is the sandbox's working directory.
func splitRemote(arg string) (id, p string, ok bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsAny(arg[:i], `/\`) {
		return "", "", false
	}
	id, p = arg[:i], arg[i+1:]
	if p == "" {
		p = "."
	}
	return id, p, true
}

// runCopy copies like `cp -r`: a file via the files routes, a directory via
// a tar through the archive routes. When the destination is an existing
// directory, the source is copied into it under its own name; otherwise the
// destination becomes the copy.
func runCopy(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox cp")
	pos, cl, err := c.start(fs, args, 2, 2)
	if err != nil {
		return err
	}
	srcID, srcPath, srcRemote := splitRemote(pos[0])
	dstID, dstPath, dstRemote := splitRemote(pos[1])
	if srcRemote == dstRemote {
		return errors.New("sandbox cp: exactly one of SRC and DST must be ID:PATH")
	}
	if dstRemote {
		if err := c.upload(ctx, cl, pos[0], dstID, dstPath); err != nil {
			return fmt.Errorf("copy %s to %s: %w", pos[0], pos[1], err)
		}
		return nil
	}
	if err := c.download(ctx, cl, srcID, srcPath, pos[1]); err != nil {
		return fmt.Errorf("copy %s to %s: %w", pos[0], pos[1], err)
	}
	return nil
}

// upload copies the local file or directory src to remote in sandbox id;
// src "-" is standard input, written as one file (mode 0644).
func (c *cli) upload(ctx context.Context, cl *client.Client, src, id, remote string) error {
	if src == stdio {
		if remote == "" || strings.HasSuffix(remote, "/") {
			return errors.New("sandbox cp: from standard input the destination must name a file, not a directory")
		}
		_, err := cl.WriteFile(ctx, id, remote, 0o644, c.stdin)
		return err
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	dest := remote
	if strings.HasSuffix(remote, "/") {
		dest = path.Join(remote, filepath.Base(abs))
	} else if fi, err := cl.Stat(ctx, id, remote); err == nil && fi.IsDir {
		dest = path.Join(remote, filepath.Base(abs))
	} else if err != nil && !client.IsNotFound(err) {
		return fmt.Errorf("stat %s: %w", remote, err)
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = cl.WriteFile(ctx, id, dest, st.Mode().Perm(), f)
		return err
	}
	// The tar is written while it is uploaded; the goroutine ends when the
	// upload has read it all or the pipe is closed.
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	var tarErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tw := tar.NewWriter(pw)
		tarErr = tw.AddFS(os.DirFS(src))
		if tarErr == nil {
			tarErr = tw.Close()
		}
		pw.CloseWithError(tarErr)
	}()
	_, err = cl.UploadArchive(ctx, id, dest, pr)
	ended := errors.New("upload ended")
	pr.CloseWithError(ended) // stops the writer if the upload ended early
	wg.Wait()
	if tarErr != nil && !errors.Is(tarErr, ended) {
		return fmt.Errorf("archive %s: %w", src, tarErr) // the cause of a failed upload
	}
	return err
}

// stdio is the local path "-": standard output as a destination,
// standard input as a source.
const stdio = "-"

// download copies remote in sandbox id to the local path dst; dst "-" is
// standard output: a file's bytes, or a directory as a tar.
func (c *cli) download(ctx context.Context, cl *client.Client, id, remote, dst string) error {
	fi, err := cl.Stat(ctx, id, remote)
	if err != nil {
		return fmt.Errorf("stat %s: %w", remote, err)
	}
	if dst == stdio {
		var rc io.ReadCloser
		if fi.IsDir {
			rc, err = cl.DownloadArchive(ctx, id, remote, false)
		} else {
			rc, err = cl.ReadFile(ctx, id, remote, 0, 0)
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		if _, err := io.Copy(c.stdout, rc); err != nil {
			return fmt.Errorf("write to standard output: %w", err)
		}
		return nil
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		if base := path.Base(remote); base != "/" && base != "." {
			dst = filepath.Join(dst, base)
		}
	}
	if fi.IsDir {
		rc, err := cl.DownloadArchive(ctx, id, remote, false)
		if err != nil {
			return err
		}
		defer rc.Close()
		return extractTar(rc, dst, func(name string, typ byte) {
			fmt.Fprintf(c.stderr, "quarry: skipped %s (tar entry type %q)\n", name, typ)
		})
	}
	rc, err := cl.ReadFile(ctx, id, remote, 0, 0)
	if err != nil {
		return err
	}
	defer rc.Close()
	mode := fs.FileMode(0o644)
	if m, err := strconv.ParseUint(fi.Mode, 8, 32); err == nil {
		mode = fs.FileMode(m).Perm()
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// extractTar extracts the tar r into the directory dst (created if needed;
// an existing one keeps its mode). Every entry stays inside dst: names with
// ".." and writes through symlinks that lead outside are refused. Entries
// other than directories, regular files and symlinks are passed to skipped.
func extractTar(r io.Reader, dst string, skipped func(name string, typ byte)) error {
	_, statErr := os.Stat(dst)
	existed := statErr == nil
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	type dirMode struct {
		name string
		mode fs.FileMode
	}
	var dirs []dirMode // applied last, so that read-only directories can be filled first
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		if !fs.ValidPath(name) {
			return fmt.Errorf("archive entry %q: outside the destination", h.Name)
		}
		mode := h.FileInfo().Mode().Perm()
		if name == "." {
			if h.Typeflag == tar.TypeDir && !existed {
				dirs = append(dirs, dirMode{name, mode})
			}
			continue
		}
		if err := extractEntry(root, tr, h, name, mode); err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			dirs = append(dirs, dirMode{name, mode})
		case tar.TypeReg, tar.TypeSymlink:
		default:
			skipped(name, h.Typeflag)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chmod(dirs[i].name, dirs[i].mode); err != nil {
			return err
		}
	}
	return nil
}

// extractEntry creates one directory, regular file or symlink under root;
// other entry types are left alone.
func extractEntry(root *os.Root, tr *tar.Reader, h *tar.Header, name string, mode fs.FileMode) error {
	switch h.Typeflag {
	case tar.TypeDir:
		return root.MkdirAll(name, 0o755)
	case tar.TypeReg:
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		if err := f.Chmod(mode); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	case tar.TypeSymlink:
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return root.Symlink(h.Linkname, name)
	}
	return nil
}
