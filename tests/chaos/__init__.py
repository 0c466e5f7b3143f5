"""The chaos suite: real worker, producer, coordinator and Redis processes under a fault schedule."""
