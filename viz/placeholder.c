/* Placeholder translation unit: removed once viz/ has sources of its own. */
typedef int ms__viz_placeholder_t;
