package gateway

import (
	_ "embed"

	"github.com/gofiber/fiber/v2"
)

// openAPI is the OpenAPI 3 document of the REST API, written by hand and
// kept in sync with routeTable by TestOpenAPI_MatchesRoutes.
//
//go:embed openapi.json
var openAPI []byte

// serveOpenAPI handles GET /openapi.json.
func serveOpenAPI(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSONCharsetUTF8)
	return c.Send(openAPI)
}
