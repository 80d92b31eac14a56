// AuthBrokerDaemon
