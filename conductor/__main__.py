from conductor.cli.entry import main

main()
