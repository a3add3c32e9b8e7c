def get_inputs():
    return []


def get_init_inputs():
    return []
