"""The wire API: every message the processes exchange, the error wire type, and the protocol
helpers both ends of a stream share.

Clients and servers import their messages from here (as CockroachDB's ``kvpb``), so no
service's package is needed to talk to it. This package sits above ``meta`` (messages carry
cluster-state records) and below every service.
"""
