package execagent

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// The messages of envd's protos (e2b-dev/E2B spec/envd/process/process.proto
// and spec/envd/filesystem/filesystem.proto), written as the JSON protojson
// renders: camelCase names, int64 as strings, bytes as base64, enums by
// name, Timestamps in RFC 3339, fields at their zero value left out unless
// they are optional or a member of a oneof (then a pointer). Requests are
// decoded by decodeProto (envd.go), answers encoded with encoding/json.

// connectErrorBody is Connect's error: a unary answer's body, and the error
// of an end-of-stream envelope.
type connectErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// connectEndStream is Connect's end-of-stream message.
type connectEndStream struct {
	Error *connectErrorBody `json:"error,omitempty"`
}

// envdHTTPError is envd's error body on its HTTP routes (/files).
type envdHTTPError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// pbUint32 is a uint32 of a request: a JSON number, or a string holding
// one, as protojson reads it.
type pbUint32 uint32

func (u *pbUint32) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	n, err := strconv.ParseUint(strings.Trim(s, `"`), 10, 32)
	if err != nil {
		return invalid("body", "%s is not a uint32", s)
	}
	*u = pbUint32(n)
	return nil
}

// pbBytes is a bytes field of a request: base64, standard or URL-safe,
// with or without padding, as protojson reads it.
type pbBytes []byte

func (p *pbBytes) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return invalid("body", "a bytes field must be a base64 string, not %s", b)
	}
	s = strings.TrimRight(s, "=")
	enc := base64.RawStdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.RawURLEncoding
	}
	d, err := enc.DecodeString(s)
	if err != nil {
		return invalid("body", "a bytes field is not base64: %s", err.Error())
	}
	*p = d
	return nil
}

// pbTimestamp is a google.protobuf.Timestamp: RFC 3339 in UTC with 0, 3, 6
// or 9 fractional digits, as protojson writes it.
type pbTimestamp time.Time

func (t pbTimestamp) MarshalJSON() ([]byte, error) {
	tt := time.Time(t).UTC()
	layout := "2006-01-02T15:04:05.000000000Z"
	switch ns := tt.Nanosecond(); {
	case ns == 0:
		layout = "2006-01-02T15:04:05Z"
	case ns%1e6 == 0:
		layout = "2006-01-02T15:04:05.000Z"
	case ns%1e3 == 0:
		layout = "2006-01-02T15:04:05.000000Z"
	}
	return []byte(`"` + tt.Format(layout) + `"`), nil
}

// ---- process.Process

// pbProcessConfig is process.ProcessConfig.
type pbProcessConfig struct {
	Cmd  string            `json:"cmd,omitempty"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// pbPTY is process.PTY.
type pbPTY struct {
	Size *pbPTYSize `json:"size,omitempty"`
}

// pbPTYSize is process.PTY.Size.
type pbPTYSize struct {
	Cols pbUint32 `json:"cols,omitempty"`
	Rows pbUint32 `json:"rows,omitempty"`
}

// pbStartRequest is process.StartRequest. Stdin unset means a stdin pipe
// (envd's default, kept for older clients).
type pbStartRequest struct {
	Process *pbProcessConfig `json:"process"`
	PTY     *pbPTY           `json:"pty"`
	Tag     *string          `json:"tag"`
	Stdin   *bool            `json:"stdin"`
}

// pbProcessSelector is process.ProcessSelector: a oneof of pid and tag.
type pbProcessSelector struct {
	PID *pbUint32 `json:"pid"`
	Tag *string   `json:"tag"`
}

// pbProcessRequest is every request naming one process:
// process.ConnectRequest, CloseStdinRequest.
type pbProcessRequest struct {
	Process *pbProcessSelector `json:"process"`
}

// pbProcessInput is process.ProcessInput: a oneof of stdin and pty bytes.
type pbProcessInput struct {
	Stdin *pbBytes `json:"stdin"`
	PTY   *pbBytes `json:"pty"`
}

// pbSendInputRequest is process.SendInputRequest.
type pbSendInputRequest struct {
	Process *pbProcessSelector `json:"process"`
	Input   *pbProcessInput    `json:"input"`
}

// pbStreamInputRequest is process.StreamInputRequest: a oneof of start
// (the process), data (input) and keepalive.
type pbStreamInputRequest struct {
	Start *struct {
		Process *pbProcessSelector `json:"process"`
	} `json:"start"`
	Data *struct {
		Input *pbProcessInput `json:"input"`
	} `json:"data"`
	Keepalive *struct{} `json:"keepalive"`
}

// pbSignal is process.Signal, by name or number.
type pbSignal int

// The values of process.Signal.
const (
	signalUnspecified pbSignal = 0
	signalSIGKILL     pbSignal = 9
	signalSIGTERM     pbSignal = 15
)

func (p *pbSignal) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	switch s {
	case "null", "SIGNAL_UNSPECIFIED":
		*p = signalUnspecified
	case "SIGNAL_SIGKILL":
		*p = signalSIGKILL
	case "SIGNAL_SIGTERM":
		*p = signalSIGTERM
	default:
		n, err := strconv.Atoi(s)
		if err != nil {
			return invalid("signal", "%s is not a process.Signal (SIGNAL_SIGTERM, SIGNAL_SIGKILL)", b)
		}
		*p = pbSignal(n)
	}
	return nil
}

// pbSendSignalRequest is process.SendSignalRequest.
type pbSendSignalRequest struct {
	Process *pbProcessSelector `json:"process"`
	Signal  pbSignal           `json:"signal"`
}

// pbUpdateRequest is process.UpdateRequest.
type pbUpdateRequest struct {
	Process *pbProcessSelector `json:"process"`
	PTY     *pbPTY             `json:"pty"`
}

// pbEmpty is every message without fields: ListRequest, and the answers
// UpdateResponse, SendInputResponse, StreamInputResponse,
// SendSignalResponse, CloseStdinResponse, filesystem.RemoveResponse and
// RemoveWatcherResponse.
type pbEmpty struct{}

// pbProcessInfo is process.ProcessInfo.
type pbProcessInfo struct {
	Config pbProcessConfig `json:"config"`
	PID    uint32          `json:"pid,omitempty"`
	Tag    *string         `json:"tag,omitempty"`
}

// pbListResponse is process.ListResponse.
type pbListResponse struct {
	Processes []pbProcessInfo `json:"processes,omitempty"`
}

// pbProcessStream is process.StartResponse and ConnectResponse.
type pbProcessStream struct {
	Event pbProcessEvent `json:"event"`
}

// pbProcessEvent is process.ProcessEvent: a oneof of start, data, end and
// keepalive.
type pbProcessEvent struct {
	Start     *pbStartEvent `json:"start,omitempty"`
	Data      *pbDataEvent  `json:"data,omitempty"`
	End       *pbEndEvent   `json:"end,omitempty"`
	Keepalive *struct{}     `json:"keepalive,omitempty"`
}

// pbStartEvent is process.ProcessEvent.StartEvent.
type pbStartEvent struct {
	PID uint32 `json:"pid,omitempty"`
}

// pbDataEvent is process.ProcessEvent.DataEvent: a oneof of stdout, stderr
// and pty bytes.
type pbDataEvent struct {
	Stdout *[]byte `json:"stdout,omitempty"`
	Stderr *[]byte `json:"stderr,omitempty"`
	PTY    *[]byte `json:"pty,omitempty"`
}

// pbEndEvent is process.ProcessEvent.EndEvent.
type pbEndEvent struct {
	ExitCode int32   `json:"exitCode,omitempty"`
	Exited   bool    `json:"exited,omitempty"`
	Status   string  `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// ---- filesystem.Filesystem

// The names of filesystem.FileType (FILE_TYPE_UNSPECIFIED, the zero, is left
// out as "").
const (
	fileTypeFile      = "FILE_TYPE_FILE"
	fileTypeDirectory = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   = "FILE_TYPE_SYMLINK"
)

// The names of filesystem.EventType.
const (
	eventCreate = "EVENT_TYPE_CREATE"
	eventWrite  = "EVENT_TYPE_WRITE"
	eventRemove = "EVENT_TYPE_REMOVE"
	eventRename = "EVENT_TYPE_RENAME"
	eventChmod  = "EVENT_TYPE_CHMOD"
)

// pbPathRequest is filesystem.StatRequest, MakeDirRequest and
// RemoveRequest.
type pbPathRequest struct {
	Path string `json:"path"`
}

// pbListDirRequest is filesystem.ListDirRequest (depth 0 means 1).
type pbListDirRequest struct {
	Path  string   `json:"path"`
	Depth pbUint32 `json:"depth"`
}

// pbMoveRequest is filesystem.MoveRequest.
type pbMoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// pbWatchRequest is filesystem.WatchDirRequest and CreateWatcherRequest.
type pbWatchRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
}

// pbWatcherRequest is filesystem.GetWatcherEventsRequest and
// RemoveWatcherRequest.
type pbWatcherRequest struct {
	WatcherID string `json:"watcherId"`
}

// pbEntryInfo is filesystem.EntryInfo.
type pbEntryInfo struct {
	Name          string            `json:"name,omitempty"`
	Type          string            `json:"type,omitempty"`
	Path          string            `json:"path,omitempty"`
	Size          int64             `json:"size,omitempty,string"`
	Mode          uint32            `json:"mode,omitempty"`
	Permissions   string            `json:"permissions,omitempty"`
	Owner         string            `json:"owner,omitempty"`
	Group         string            `json:"group,omitempty"`
	ModifiedTime  *pbTimestamp      `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// pbEntryResponse is filesystem.StatResponse, MakeDirResponse and
// MoveResponse.
type pbEntryResponse struct {
	Entry *pbEntryInfo `json:"entry,omitempty"`
}

// pbListDirResponse is filesystem.ListDirResponse.
type pbListDirResponse struct {
	Entries []*pbEntryInfo `json:"entries,omitempty"`
}

// pbFilesystemEvent is filesystem.FilesystemEvent.
type pbFilesystemEvent struct {
	Name  string       `json:"name,omitempty"`
	Type  string       `json:"type,omitempty"`
	Entry *pbEntryInfo `json:"entry,omitempty"`
}

// pbWatchDirResponse is filesystem.WatchDirResponse: a oneof of start,
// filesystem and keepalive.
type pbWatchDirResponse struct {
	Start      *struct{}          `json:"start,omitempty"`
	Filesystem *pbFilesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *struct{}          `json:"keepalive,omitempty"`
}

// pbCreateWatcherResponse is filesystem.CreateWatcherResponse.
type pbCreateWatcherResponse struct {
	WatcherID string `json:"watcherId,omitempty"`
}

// pbGetWatcherEventsResponse is filesystem.GetWatcherEventsResponse.
type pbGetWatcherEventsResponse struct {
	Events []pbFilesystemEvent `json:"events,omitempty"`
}

// envdUploadEntry is an entry of envd's upload answer (its OpenAPI
// EntryInfo, not the proto's): type is "file".
type envdUploadEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}
