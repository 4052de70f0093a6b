package rockcompat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
)

// readFileRequest is ROCK's SandboxReadFileRequest.
type readFileRequest struct {
	SandboxID string  `json:"sandbox_id"`
	Path      string  `json:"path"`
	Encoding  *string `json:"encoding"`
	Errors    *string `json:"errors"`
}

// readFile serves read_file: the whole file as text (at most MaxReadFile
// bytes), decoded as UTF-8 (default) or Latin-1, with Python's error modes
// strict (default), replace and ignore.
func (s *Service) readFile(c *fiber.Ctx, owner string) (any, error) {
	var req readFileRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	if req.Path == "" {
		return nil, badinput.New("path", "is required")
	}
	enc := "utf-8"
	if req.Encoding != nil && *req.Encoding != "" {
		enc = strings.ReplaceAll(strings.ToLower(*req.Encoding), "_", "-")
	}
	mode := "strict"
	if req.Errors != nil && *req.Errors != "" {
		mode = *req.Errors
	}
	switch {
	case enc != "utf-8" && enc != "utf8" && enc != "latin-1" && enc != "latin1" && enc != "iso-8859-1" && enc != "ascii":
		return nil, badinput.New("encoding", "must be utf-8, ascii or latin-1, got %q", *req.Encoding)
	case mode != "strict" && mode != "replace" && mode != "ignore":
		return nil, badinput.New("errors", "must be strict, replace or ignore, got %q", mode)
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout+s.cfg.RequestTimeout)
	defer cancel()
	l, err := s.active(ctx, owner, req.SandboxID)
	if err != nil {
		return nil, err
	}
	rc, err := s.agent(l).ReadFile(ctx, req.Path, 0, s.cfg.MaxReadFile+1)
	if err != nil {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, s.cfg.MaxReadFile+1))
	if err != nil {
		return nil, errclass.Sandbox(req.SandboxID, fmt.Errorf("read %s: %w", req.Path, err))
	}
	if int64(len(b)) > s.cfg.MaxReadFile {
		return nil, badinput.New("path", "%s is larger than read_file's limit of %d bytes; use execute or download it in parts", req.Path, s.cfg.MaxReadFile)
	}
	content, err := decodeText(b, enc, mode)
	if err != nil {
		return nil, badinput.New("encoding", "%s: %s", req.Path, err.Error())
	}
	return map[string]string{"content": content}, nil
}

// decodeText decodes b like Python's bytes.decode(enc, mode).
func decodeText(b []byte, enc, mode string) (string, error) {
	var sb strings.Builder
	sb.Grow(len(b))
	switch enc {
	case "latin-1", "latin1", "iso-8859-1":
		for _, c := range b {
			sb.WriteRune(rune(c))
		}
		return sb.String(), nil
	case "ascii":
		for i, c := range b {
			switch {
			case c < 0x80:
				sb.WriteByte(c)
			case mode == "strict":
				return "", fmt.Errorf("byte 0x%02x at offset %d is not ASCII", c, i)
			case mode == "replace":
				sb.WriteRune(utf8.RuneError)
			}
		}
		return sb.String(), nil
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r != utf8.RuneError || n > 1:
			sb.WriteRune(r)
		case mode == "strict":
			return "", fmt.Errorf("invalid UTF-8 at offset %d (pass errors=\"replace\" or encoding=\"latin-1\")", i)
		case mode == "replace":
			sb.WriteRune(utf8.RuneError)
		}
		i += n
	}
	return sb.String(), nil
}

// writeFileRequest is ROCK's SandboxWriteFileRequest.
type writeFileRequest struct {
	SandboxID string  `json:"sandbox_id"`
	Path      string  `json:"path"`
	Content   *string `json:"content"`
}

// successResult is ROCK's WriteFileResponse and UploadResponse.
type successResult struct {
	Success  bool   `json:"success"`
	Message  string `json:"message"`
	FileName string `json:"file_name,omitempty"`
}

// writeFile serves write_file: content (UTF-8) replaces the file at path;
// parent directories are created.
func (s *Service) writeFile(c *fiber.Ctx, owner string) (any, error) {
	var req writeFileRequest
	if err := s.decode(c, &req); err != nil {
		return nil, err
	}
	if req.Path == "" {
		return nil, badinput.New("path", "is required")
	}
	if req.Content == nil {
		return nil, badinput.New("content", "is required")
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ManagerTimeout+s.cfg.RequestTimeout)
	defer cancel()
	l, err := s.active(ctx, owner, req.SandboxID)
	if err != nil {
		return nil, err
	}
	if _, err := s.agent(l).WriteFile(ctx, req.Path, 0, strings.NewReader(*req.Content)); err != nil {
		return nil, errclass.Sandbox(req.SandboxID, err)
	}
	return successResult{Success: true, Message: "wrote " + req.Path}, nil
}

// upload serves upload: a multipart form with the fields sandbox_id and
// target_path and the part file, whose bytes replace the file at
// target_path. The SDK sends the fields first, so the file streams through
// to the agent; a file part that comes first is buffered up to MaxJSONBody.
func (s *Service) upload(c *fiber.Ctx, owner string) (any, error) {
	_, params, err := mime.ParseMediaType(string(c.Request().Header.ContentType()))
	if err != nil || params["boundary"] == "" {
		return nil, badinput.New("body", "must be multipart/form-data with fields file, target_path and sandbox_id")
	}
	body, err := s.body(c, s.cfg.MaxUploadBody)
	if err != nil {
		return nil, err
	}
	mr := multipart.NewReader(body, params["boundary"])
	var (
		sandboxID, target, fileName string
		buffered                    *bytes.Buffer
		written                     bool
	)
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.CreateTimeout+s.cfg.ManagerTimeout)
	defer cancel()
	write := func(r io.Reader) error {
		if sandboxID == "" {
			return badinput.New("sandbox_id", "is required")
		}
		if target == "" {
			return badinput.New("target_path", "is required")
		}
		l, err := s.active(ctx, owner, sandboxID)
		if err != nil {
			return err
		}
		if _, err := s.agent(l).WriteFile(ctx, target, 0, r); err != nil {
			return errclass.Sandbox(sandboxID, err)
		}
		written = true
		return nil
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, badinput.New("body", "malformed multipart body: %s", err.Error())
		}
		switch part.FormName() {
		case "sandbox_id", "target_path":
			v, err := io.ReadAll(io.LimitReader(part, 4097))
			if err != nil || len(v) > 4096 {
				return nil, badinput.New(part.FormName(), "must be at most 4096 bytes")
			}
			if part.FormName() == "sandbox_id" {
				sandboxID = string(v)
			} else {
				target = string(v)
			}
		case "file":
			if written || buffered != nil {
				return nil, badinput.New("file", "only one file part is allowed")
			}
			fileName = part.FileName()
			if sandboxID != "" && target != "" {
				if err := write(part); err != nil {
					return nil, err
				}
				continue
			}
			buffered = new(bytes.Buffer)
			if n, err := buffered.ReadFrom(io.LimitReader(part, s.cfg.MaxJSONBody+1)); err != nil || n > s.cfg.MaxJSONBody {
				return nil, badinput.New("file", "send sandbox_id and target_path before a file part larger than %d bytes", s.cfg.MaxJSONBody)
			}
		default:
			_, _ = io.Copy(io.Discard, io.LimitReader(part, 1<<20))
		}
	}
	if !written {
		if buffered == nil {
			return nil, badinput.New("file", "is required")
		}
		if err := write(buffered); err != nil {
			return nil, err
		}
	}
	return successResult{Success: true, Message: "uploaded " + fileName + " to " + target, FileName: fileName}, nil
}
