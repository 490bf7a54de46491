"""shardkit: sharded and parallel computation on JAX, made practical."""

__version__ = "0.1.0"
