package execagent

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// portForwardBuf is the size of one TCP read forwarded as a message.
const portForwardBuf = 32 << 10

// closeWait bounds the write of a close message.
const closeWait = time.Second

// handlePortForward answers RoutePortForward: it connects to the port, then
// upgrades, then copies bytes both ways until either side ends. The
// server's Close ends it (the connections are closed when s.ctx is done).
func (s *Server) handlePortForward(w http.ResponseWriter, r *http.Request) error {
	port, err := parsePort(r.PathValue("port"))
	if err != nil {
		return err
	}
	d := net.Dialer{Timeout: portDialTimeout}
	tcp, err := d.DialContext(r.Context(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return statusError(err, http.StatusBadGateway, agentapi.CodePortClosed, "nothing is listening on port %d in the sandbox", port)
	}
	defer tcp.Close()
	up := websocket.Upgrader{ReadBufferSize: portForwardBuf, WriteBufferSize: portForwardBuf, CheckOrigin: func(*http.Request) bool { return true }}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil // the upgrader answered
	}
	defer ws.Close()
	ws.SetReadLimit(agentapi.MaxPortMessage)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // ends with the handler (stop) or closes both at Close
		select {
		case <-s.ctx.Done():
			_ = tcp.Close()
			_ = ws.Close()
		case <-stop:
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // TCP → WebSocket
		defer wg.Done()
		buf := make([]byte, portForwardBuf)
		for {
			n, err := tcp.Read(buf)
			if n > 0 && ws.WriteMessage(websocket.BinaryMessage, buf[:n]) != nil {
				break
			}
			if err != nil {
				code := websocket.CloseNormalClosure
				if !errors.Is(err, io.EOF) {
					code = websocket.CloseInternalServerErr
				}
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, "tcp connection ended"), time.Now().Add(closeWait))
				break
			}
		}
		_ = ws.Close()
	}()
	for { // WebSocket → TCP
		_, m, err := ws.NextReader()
		if err != nil {
			break
		}
		if _, err := io.Copy(tcp, m); err != nil {
			break
		}
	}
	_ = tcp.Close()
	wg.Wait()
	return nil
}
