"""Generated protobuf and gRPC modules of jobbroker.v1 (made from proto/ at build time)."""
