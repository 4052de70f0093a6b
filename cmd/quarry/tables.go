package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/quarryhq/quarry/checkpoints/s3store"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

// tablesCommands are the subcommands of `quarry tables`: the DynamoDB lease
// store's tables, for local use and tests (production creates them with
// its infrastructure code).
func tablesCommands() []command {
	return []command{
		{"create", "quarry tables create [--tasks-table T] [--leases-table T] [--relay-table T] [--checkpoint-table T] [--shards N] [--region R] [--timeout D]",
			"create the lease store's, the model relay's and the S3 checkpoint store's DynamoDB tables (idempotent; waits until they are ACTIVE)", runTablesCreate},
		{"delete", "quarry tables delete [--tasks-table T] [--leases-table T] [--relay-table T] [--checkpoint-table T] [--region R] [--timeout D]",
			"delete the lease store's, the model relay's and the S3 checkpoint store's DynamoDB tables and everything in them", runTablesDelete},
	}
}

func runTablesCreate(ctx context.Context, c *cli, args []string) error {
	return c.tables(ctx, "create", args, func(ctx context.Context, api *dynamodb.Client, cfg dynamostore.Config, other otherTables) error {
		if err := dynamostore.CreateTables(ctx, api, cfg); err != nil {
			return err
		}
		if err := dynamobroker.CreateTables(ctx, api, other.relay); err != nil {
			return err
		}
		return s3store.CreateTables(ctx, api, other.checkpoints)
	})
}

func runTablesDelete(ctx context.Context, c *cli, args []string) error {
	return c.tables(ctx, "delete", args, func(ctx context.Context, api *dynamodb.Client, cfg dynamostore.Config, other otherTables) error {
		if err := dynamostore.DeleteTables(ctx, api, cfg); err != nil {
			return err
		}
		if err := dynamobroker.DeleteTables(ctx, api, other.relay); err != nil {
			return err
		}
		return s3store.DeleteTables(ctx, api, other.checkpoints)
	})
}

// tables runs `quarry tables <name>`: it reads the table settings (flags,
// else QUARRY_DYNAMODB_* as the gateway reads them, else the store's
// defaults), loads the AWS SDK's standard configuration (AWS_REGION,
// AWS_ENDPOINT_URL, credentials) and runs op.
func (c *cli) tables(ctx context.Context, name string, args []string, op func(context.Context, *dynamodb.Client, dynamostore.Config, otherTables) error) error {
	usage := usageOf("tables "+name) + "\nThe AWS SDK's standard settings apply (AWS_REGION, AWS_ENDPOINT_URL, credentials).\n"
	cfg := dynamostore.Config{
		TasksTable:  cmp.Or(c.getenv("QUARRY_DYNAMODB_TASKS_TABLE"), dynamostore.DefaultTasksTable),
		LeasesTable: cmp.Or(c.getenv("QUARRY_DYNAMODB_LEASES_TABLE"), dynamostore.DefaultLeasesTable),
		Shards:      dynamostore.DefaultShards,
		Region:      c.getenv("QUARRY_DYNAMODB_REGION"),
	}
	if v := c.getenv("QUARRY_DYNAMODB_SHARDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("QUARRY_DYNAMODB_SHARDS: want a number, got %q", v)
		}
		cfg.Shards = n
	}
	fs := c.flags("tables " + name)
	fs.StringVar(&cfg.TasksTable, "tasks-table", cfg.TasksTable, "tasks table (env QUARRY_DYNAMODB_TASKS_TABLE)")
	fs.StringVar(&cfg.LeasesTable, "leases-table", cfg.LeasesTable, "leases table (env QUARRY_DYNAMODB_LEASES_TABLE)")
	other := otherTables{
		relay:       cmp.Or(c.getenv("QUARRY_RELAY_DYNAMODB_TABLE"), dynamobroker.DefaultTable),
		checkpoints: cmp.Or(c.getenv("QUARRY_CHECKPOINT_TABLE"), s3store.DefaultTable),
	}
	fs.StringVar(&other.relay, "relay-table", other.relay, "model relay table (env QUARRY_RELAY_DYNAMODB_TABLE)")
	fs.StringVar(&other.checkpoints, "checkpoint-table", other.checkpoints, "S3 checkpoint store's table (env QUARRY_CHECKPOINT_TABLE)")
	fs.IntVar(&cfg.Shards, "shards", cfg.Shards, "shards of each hot key; the gateways must use the same (env QUARRY_DYNAMODB_SHARDS)")
	fs.StringVar(&cfg.Region, "region", cfg.Region, "AWS region (env QUARRY_DYNAMODB_REGION; default the SDK's, AWS_REGION)")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the tables")
	if err := c.noArgs(fs, args, usage); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout: must be positive, got %s", *timeout)
	}
	cfg.TableWait = *timeout
	if cfg.Shards < 1 { // the store reads 0 as its default; a person who typed it meant something else
		return fmt.Errorf("--shards (QUARRY_DYNAMODB_SHARDS): must be at least 1, got %d", cfg.Shards)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("tables %s: %w", name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx, cfg.SDKOptions()...)
	if err != nil {
		return fmt.Errorf("load AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return errors.New("--region (AWS_REGION): no AWS region is configured")
	}
	if err := op(ctx, dynamodb.NewFromConfig(awsCfg), cfg, other); err != nil {
		return fmt.Errorf("tables %s: %w", name, err)
	}
	_, err = fmt.Fprintf(c.stdout, "%sd tables %s, %s, %s and %s (region %s)\n", name, cfg.TasksTable, cfg.LeasesTable, other.relay, other.checkpoints, awsCfg.Region)
	return err
}

// noArgs parses the flags of a command that takes no arguments.
func (c *cli) noArgs(fs *flag.FlagSet, args []string, usage string) error {
	pos, rest, err := c.parse(fs, args, usage)
	if err != nil {
		return err
	}
	if pos = append(pos, rest...); len(pos) > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), pos[0])
	}
	return nil
}

// otherTables are the tables of `quarry tables` beside the lease store's.
type otherTables struct {
	relay       string // the model relay's (dynamobroker)
	checkpoints string // the S3 checkpoint store's (s3store)
}

// localStackHook renders the LocalStack init hook committed as
// localstack/init/ready.d/10-quarry-tables.sh: every table `quarry tables
// create` makes, with the default names.
func localStackHook() (string, error) {
	return dynamostore.RenderLocalStackInit(dynamostore.Config{}, dynamostore.ExtraTable{
		Def: dynamobroker.TableDefinition(dynamobroker.DefaultTable), TTLAttribute: dynamobroker.TTLAttribute,
	}, dynamostore.ExtraTable{Def: s3store.TableDefinition(s3store.DefaultTable)})
}
