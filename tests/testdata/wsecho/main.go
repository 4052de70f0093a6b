// Command wsecho is a WebSocket echo server for tests/ports_test.go: it
// listens on 127.0.0.1:$PORT, selects the subprotocol echo.v1 when offered
// and sends every message back.
package main

import (
	"log"
	"net/http"
	"os"

	"github.com/fasthttp/websocket"
)

func main() {
	up := websocket.Upgrader{Subprotocols: []string{"echo.v1"}}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			mt, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			if c.WriteMessage(mt, m) != nil {
				return
			}
		}
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil))
}
