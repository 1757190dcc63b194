"""Wire protocol: transports, framing, typed messages, authentication, request/response."""
