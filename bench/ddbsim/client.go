package ddbsim

import (
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Client returns an SDK client of the simulator at endpoint (Start's URL):
// fake static credentials, the default region, maxAttempts tries per call
// (0: the SDK's default), and a connection pool that keeps up to 1,024
// idle connections (the SDK keeps 10 per host, and many concurrent
// callers would otherwise open a connection per call). It reads nothing
// from the environment.
func Client(endpoint string, maxAttempts int) *dynamodb.Client {
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConns = 1024
		t.MaxIdleConnsPerHost = 1024
	})
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint:     aws.String(endpoint),
		Region:           DefaultRegion,
		Credentials:      credentials.NewStaticCredentialsProvider("ddbsim", "ddbsim", ""),
		RetryMaxAttempts: maxAttempts,
		HTTPClient:       hc,
	})
}
