"""MEASURE one server under load: workload, client, load drivers, metrics, spec acceptance."""
