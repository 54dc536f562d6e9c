from dualtrain.cli import main

main()
