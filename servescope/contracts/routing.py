"""The router's policies, one list for the replica model that plans with them and the nginx router that runs them."""

ROUND_ROBIN = "round_robin"
LEAST_CONN = "least_conn"  # nginx's least_conn: the replica with the fewest requests, ties taken in turn
POLICIES = (ROUND_ROBIN, LEAST_CONN)
