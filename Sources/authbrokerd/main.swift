print("authbrokerd")
