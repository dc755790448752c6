from tkbox.cli.main import main

main()
