// FleetTokenPostgres: the token store on PostgreSQL, for replicas on several hosts that share
// one database (one fetch per key per token lifetime across all of them).
