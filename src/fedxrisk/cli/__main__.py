from fedxrisk.cli import main

main()
