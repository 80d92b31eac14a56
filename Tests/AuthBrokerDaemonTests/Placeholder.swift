// Tests for the daemon's pieces that need no socket.
