"""Built-in workloads: analytical transformer models and tiny synthetic chains."""
