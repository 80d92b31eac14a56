// AuthBrokerTrust
