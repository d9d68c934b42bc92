// The PostgreSQL tests; see PostgresServer in TestSupportKit for the private cluster.
