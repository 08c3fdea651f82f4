"""gRPC framing: one bidirectional stream per actor."""
