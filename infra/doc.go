// Package infra holds the Terraform deployment of Quarry (modules/quarry,
// examples/basic; docs/DEPLOY.md) and no Go code: its tests check the
// module with HashiCorp's own libraries, without Terraform or the network.
// The HCL parses and is formatted as `terraform fmt` formats it
// (hclwrite), the module and the example load without diagnostics
// (terraform-config-inspect) with every variable and output described, the
// DynamoDB tables are exactly those the Go stores create
// (dynamostore.TableDefinitions, dynamobroker.TableDefinition), every
// QUARRY_* variable the module sets is one the docs describe, the family
// prefix the gateway may register task definitions in is one the ECS
// provider renders (and no pool's Terraform family starts with it), and the
// ECR pull-through cache is optional.
//
// It must not be imported; its tests may import only the stores' schema
// (warmpool/dynamostore, modelservice/dynamobroker, checkpoints/s3store)
// and the ECS provider's renderer (providers/ecs, with the providers.Spec it
// renders).
package infra
