import AuthBrokerCLI

await AuthBrokerCtl.runFromCommandLine()
