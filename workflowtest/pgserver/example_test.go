package pgserver_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/workflowtest/pgserver"
)

func Example() {
	ctx := context.Background()
	srv, err := pgserver.Find(ctx, &pgserver.Opts{Logf: log.Printf})
	if err != nil {
		log.Fatal(err) // says how to install PostgreSQL or which variable to set
	}
	defer srv.Close() // stops the server only if Find started it

	conn, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var canCreate bool
	if err := conn.QueryRow(ctx, "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user").Scan(&canCreate); err != nil {
		log.Fatal(err)
	}
	fmt.Println("may create databases:", canCreate)
	// Output: may create databases: true
}
