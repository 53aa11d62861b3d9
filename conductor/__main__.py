from conductor.cli.app import main

main()
