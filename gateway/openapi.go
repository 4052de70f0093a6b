package gateway

import (
	_ "embed"

	"github.com/gofiber/fiber/v2"
)

// openAPI is the OpenAPI 3 document of the REST API, written by hand and
// embedded in the binary: serving it is one write of these bytes. The tests
// keep it true: TestOpenAPI_MatchesRoutes holds its operations against the
// registered routes (every optional service on), TestOpenAPI_405CarriesAllow
// its methods against each path's 405 and Allow, and
// TestOpenAPI_DeclaresWhatTheServerAnswers and
// TestOpenAPI_StoreDownIs503WithRetryAfter its statuses against answers.
//
//go:embed openapi.json
var openAPI []byte

// serveOpenAPI handles GET /openapi.json.
func serveOpenAPI(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSONCharsetUTF8)
	return c.Send(openAPI)
}
