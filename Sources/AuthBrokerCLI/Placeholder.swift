// AuthBrokerCLI
