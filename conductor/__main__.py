from conductor.cli import main

main()
