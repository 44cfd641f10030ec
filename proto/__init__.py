"""Wire contract (fleet.proto), its generated modules (committed; `make proto` regenerates them),
tensors on the wire and the shared gRPC options. Installed as flexfl.proto."""
