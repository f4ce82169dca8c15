"""Remote boards through TVM's RPC tracker: running an artifact there, and measuring tuning candidates there."""
