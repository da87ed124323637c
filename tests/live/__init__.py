"""Live tests: real systemd hosts (systemd-nspawn containers) over real SSH."""
