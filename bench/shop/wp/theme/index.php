<!doctype html>
<html <?php language_attributes(); ?>>
<head><meta charset="<?php bloginfo('charset'); ?>"><title><?php wp_title('|', true, 'right'); bloginfo('name'); ?></title>
<?php wp_head(); ?></head>
<body <?php body_class(); ?>>
<header><h1><a href="<?php echo esc_url(home_url('/')); ?>"><?php bloginfo('name'); ?></a></h1><?php get_search_form(); ?>
<nav><?php wp_list_categories(['title_li' => '', 'show_count' => true]); ?></nav></header>
<main>
<?php if (have_posts()) : while (have_posts()) : the_post(); ?>
  <article id="post-<?php the_ID(); ?>" <?php post_class(); ?>>
    <h2><a href="<?php the_permalink(); ?>"><?php the_title(); ?></a></h2>
    <?php if (is_singular()) : the_content(); the_tags('<p>Tags: ', ', ', '</p>'); ?>
      <section class="reviews"><h3><?php comments_number('No reviews yet', 'One review', '% reviews'); ?></h3>
      <ol><?php wp_list_comments(['per_page' => 20, 'reverse_top_level' => true], get_comments(['post_id' => get_the_ID(), 'number' => 20])); ?></ol>
      <?php comment_form(['title_reply' => 'Write a review']); ?></section>
    <?php else : the_excerpt(); endif; ?>
  </article>
<?php endwhile; the_posts_pagination(); else : ?>
  <p>Nothing found.</p>
<?php endif; ?>
</main>
<aside><h3>Recent products</h3><ul><?php wp_get_archives(['type' => 'postbypost', 'limit' => 10]); ?></ul></aside>
<?php wp_footer(); ?>
</body></html>
