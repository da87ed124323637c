from hosttune.cli import main

main()
