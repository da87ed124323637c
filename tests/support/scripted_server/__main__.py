"""`python -m scripted_server ARGS`: run the scripted server (see server.py for ARGS)."""

from scripted_server.server import main

main()
