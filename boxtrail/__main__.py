from boxtrail.cli import main

main()
