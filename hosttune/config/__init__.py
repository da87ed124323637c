"""What the user configures: the inventory of hosts, the tuning profile, and the YAML reader
that names file and line in every error."""
