print("authbrokerctl")
