"""The maintenance stream's stability rounds: a round's rules as a state machine
(``machine``), its I/O on the client's loop (``sender``) and its retries (``retry``), what a
round stabilises where (``plan``), the round beside Spark's commit (``tail``), the next batch
read ahead (``read_ahead``), rounds between Spark's batches (``between``), a round begun
while its batch is projected (``streamed``), the nodes a round must drop on first
(``cleaned``) and rounds for index moves on an idle keyspace (``moves``)."""
