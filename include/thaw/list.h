/* Intrusive doubly linked lists (circular, with a sentinel head).
 * An element embeds a `struct list_node`; container_of() gets the element back.
 * A node that is in no list has next == prev == NULL (list_node_init). */
#ifndef THAW_LIST_H
#define THAW_LIST_H

#include <stddef.h>
#include <stdbool.h>

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

struct list_node {
    struct list_node *next, *prev;
};

static inline void list_init(struct list_node *head)
{
    head->next = head->prev = head;
}

static inline void list_node_init(struct list_node *n)
{
    n->next = n->prev = NULL;
}

static inline bool list_empty(const struct list_node *head)
{
    return head->next == head;
}

static inline bool list_linked(const struct list_node *n)
{
    return n->next != NULL;
}

static inline void list__insert(struct list_node *n, struct list_node *prev, struct list_node *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

static inline void list_push_back(struct list_node *head, struct list_node *n)
{
    list__insert(n, head->prev, head);
}

static inline void list_push_front(struct list_node *head, struct list_node *n)
{
    list__insert(n, head, head->next);
}

static inline void list_remove(struct list_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = NULL;
}

static inline struct list_node *list_first(const struct list_node *head)
{
    return list_empty(head) ? NULL : head->next;
}

static inline struct list_node *list_last(const struct list_node *head)
{
    return list_empty(head) ? NULL : head->prev;
}

#define list_for_each_safe(pos, tmp, head)                                                         \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); (pos) = (tmp), (tmp) = (pos)->next)

#endif
